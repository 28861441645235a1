import { Component } from '@angular/core';

import { PaymentPage } from './payment-page/payment-page';

@Component({
  selector: 'app-root',
  imports: [PaymentPage],
  template: '<app-payment-page />',
})
export class App {}
